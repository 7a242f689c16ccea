"""Scale-out: the Ray backend (``backend: ray``) and data-parallel learners.

The only package of teamrl that imports Ray, and only when a run asks for it: importing
``teamrl.runtime.distributed`` needs neither Ray nor a cluster. See docs/scale-out.md.
"""
