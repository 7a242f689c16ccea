"""Study tooling: ablation grids (``teamrl ablate``), evaluation (``teamrl eval``) and reports (``teamrl report``)."""
