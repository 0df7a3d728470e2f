"""Multi-token prediction: drafts from the checkpoint's own MTP head (``--speculative mtp``)."""
