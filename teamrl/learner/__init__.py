"""Learners: one per trained physical model; its optimizer, its update, its checkpoints.

``base`` holds the contract (:class:`~teamrl.learner.base.Learner`), ``learner`` the in-process
implementation (:class:`~teamrl.learner.learner.TorchLearner`; its settings, optimizer and schedule in
``settings``), ``checkpoint`` and ``safestate``
how weights and optimizer state are written and read (safetensors only).
"""
