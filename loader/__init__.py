"""zarrfeed's reading side: open, describe and check datasets."""
from .dataset import Dataset, ValidationReport
from writer.format import FormatError

__all__ = ["Dataset", "ValidationReport", "FormatError"]
