"""zarrfeed over Arrow Flight: the server (`zarrfeed serve`), its clients and the protocol they share."""
from .remote_loader import RemoteAgentSampleLoader, RemoteEgoSampleLoader, RemoteLoader, RemoteWindowLoader
from .remote_options import RemoteOptions
from .remote_writer import RemoteWriter
from .server import FeedServer

__all__ = ["FeedServer", "RemoteAgentSampleLoader", "RemoteEgoSampleLoader", "RemoteLoader", "RemoteOptions",
           "RemoteWindowLoader", "RemoteWriter"]
