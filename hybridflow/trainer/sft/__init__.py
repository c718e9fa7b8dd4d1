"""The SFT trainer's parts (its entry point is ``trainer/sft_trainer.py``): micro-batches, the loss, Ulysses
sequence parallelism, the shared-directory checkpoint."""
