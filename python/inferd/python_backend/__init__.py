"""Triton python-backend models (``backend: "python"``, ``<version>/model.py``) served by inferd.

``pb_utils`` is inferd's own implementation of the module that model code imports as
``triton_python_backend_utils``; each model instance runs in a worker process of its own, which
puts that module in ``sys.modules`` under Triton's name before it imports ``model.py``.
"""
