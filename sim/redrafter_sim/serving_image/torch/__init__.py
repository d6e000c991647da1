# TEST DOUBLE: the emulated serving image has no torch. Never used in production.
"""The serving pods of the emulated cluster run without ``torch`` and ``transformers``.

The development environment has both (the drafter's training needs them), but importing them costs each
serving process a few seconds of CPU and some 400 MB, three processes per pod, on a 2-core machine. The
serving code supports that image (``engine_jobs.triton_models._tokenizer`` loads ``tokenizer.json`` with the
``tokenizers`` library, chat templates render with jinja2 as transformers does); the transformers path is
exercised by the OpenAI front's own tests. The node links this package into the working directory of every serving
process (Triton, its Python backend stubs, the front), first on their sys.path, so ``import torch`` finds it.
"""

raise ModuleNotFoundError("No module named 'torch' (not in the emulated serving image)", name="torch")
