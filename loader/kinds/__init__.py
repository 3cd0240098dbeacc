"""zarrfeed.loader.kinds.base."""
