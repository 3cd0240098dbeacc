"""zarrfeed.loader.ordering."""
