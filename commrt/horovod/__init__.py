"""Horovod's API on commrt.  The PyTorch flavour is ``commrt.horovod.torch``.

Layout: _coordinator (name matching, response cache, fusion; no torch),
_runtime (init/shutdown, ranks, process sets, timeline), errors,
process_sets, elastic (the elastic loop and state, torch-free); torch/ holds
everything that touches torch tensors.
"""
