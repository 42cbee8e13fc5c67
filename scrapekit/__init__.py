"""scrapekit: algorithmic scraping from a YAML recipe, on a durable queue that survives kill -9.

Plugin authors import everything they need from here.
"""

from .errors import (
    AlreadyRunning,
    PartError,
    QueueError,
    RecipeError,
    RecipeErrors,
    ScrapekitError,
    StoreError,
)
from .model import BadUrl, Item, Job, Request, Response, canonical_url
from .units import Bytes, Seconds

__version__ = "0.1.0"

__all__ = [
    "AlreadyRunning",
    "BadUrl",
    "Bytes",
    "Item",
    "Job",
    "PartError",
    "QueueError",
    "RecipeError",
    "RecipeErrors",
    "Request",
    "Response",
    "ScrapekitError",
    "Seconds",
    "StoreError",
    "__version__",
    "canonical_url",
]
