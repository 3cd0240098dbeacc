"""Where decoded chunks are kept, behind one protocol (`chunk_cache.ChunkCache`): a loader's own cache and the
host's, shared by every loader of a dataset commit on the machine."""
