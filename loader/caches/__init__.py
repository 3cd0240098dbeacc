"""zarrfeed.loader.caches."""
