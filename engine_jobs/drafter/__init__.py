"""The ReDrafter head trained from its base model (self-distillation), in PyTorch.

The worker the training Job runs (``python -m engine_jobs.drafter``): it distills the base's greedy
continuations, trains the recurrent drafter head on them, measures its held-out acceptance with PyTorch
drafting, and writes what TensorRT-LLM's ``convert_checkpoint.py --drafter_model_dir`` reads. Importing the
package imports no torch: the operator-side checks (``export.check_drafter_dir``, ``prompts.load_prompts``)
run where torch is not installed.
"""
