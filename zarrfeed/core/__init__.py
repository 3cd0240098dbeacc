"""What both sides of zarrfeed share and nothing else: the on-disk format (schemas, links, keys, the commit
log, the manifest), chunks and their digests, stores, Arrow records, worker pools and shared memory. It
imports neither `zarrfeed.writer` nor `zarrfeed.loader`."""
