"""FSDP2 fine-tuning of Llama models; the entry point is `python -m trainer.train` (see train.py).

Importing the package is free of side effects and of heavy imports: `trainer.config` and
`trainer.catalog` are pure Python and shared with the generators.
"""
