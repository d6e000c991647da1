"""Python-backend model sources copied into the generated Triton repository (see model_repo.py).

They run inside Triton's Python backend stub (``triton_python_backend_utils`` available there only),
so they are package data: never imported by the operator.
"""
