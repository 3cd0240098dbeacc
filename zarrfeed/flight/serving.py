"""What all the datasets one `zarrfeed serve` serves share: the loader and writer processes per stream or
writer, the named transforms, the limits and their slots (a cap on streams or uploads is the server's, not a
dataset's), the record of activity and the address the server listens on."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..transforms import Transforms
from .activity import Activity
from .limits import Limits, Slots


@dataclass
class Serving:
    workers: int
    transforms: Transforms
    limits: Limits
    url: Callable[[], str]
    activity: Activity = field(default_factory=Activity)
    verify_chunks: bool = True  # streams check every chunk against its recorded digest (see loader.Dataset)
    streams: Slots = field(init=False)
    uploads: Slots = field(init=False)

    def __post_init__(self) -> None:
        self.streams = Slots(self.limits.max_streams, "streams", "--max-streams")
        self.uploads = Slots(self.limits.max_uploads, "uploads", "--max-uploads")
