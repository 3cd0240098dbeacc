"""zarrfeed.loader.engine."""
