"""The trainer's data: how a split reaches the step loop.

* ``manifest``: a dataset version that lists files instead of copying them (standard library only: the
  provider's snapshot step writes it, every reader checks it).
* ``statistics``: the feature statistics of a split in one streamed pass (numpy and pandas, no torch).
* ``splits``: a split read whole into arrays (no torch: it runs in a thread while torch imports).
* ``memory``: those arrays as tensors and the resumable sampler over them (the in-memory path).
* ``streamed``: the same batches read from the manifest's row groups as the loop goes (the streamed path).

Nothing is imported here, so the provider can read the manifest without numpy or torch.
"""
