"""zarrfeed's reading side: open, describe and check datasets; load shuffled batches."""
from writer.format import FormatError

from .dataset import Dataset, ValidationReport
from .loader import Loader, LoaderError
from .windows import WindowLoader

__all__ = ["Dataset", "FormatError", "Loader", "LoaderError", "ValidationReport", "WindowLoader"]
