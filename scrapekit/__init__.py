"""scrapekit: algorithmic scraping from a YAML recipe, on a durable queue that survives kill -9.

Plugin authors import everything they need from here: the values that flow between parts
(Request, Response, Item, Job), the part protocols (Source, Queue, Transaction, Fetcher, Parser,
Store, Checkpointed), the option types (Seconds, Bytes) and the errors. PersistentQueue is the
durable queue for Python programs (scrapekit.queue).
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
from .fetchers import Fetcher
from .model import BadUrl, Item, Job, Request, Response, canonical_url
from .parsers import Parser
from .queue import PersistentQueue
from .sources import Queue, Source, Transaction
from .stores import Checkpointed, Store
from .units import Bytes, Seconds

__version__ = "0.1.0"

__all__ = [
    "AlreadyRunning",
    "BadUrl",
    "Bytes",
    "Checkpointed",
    "Fetcher",
    "Item",
    "Job",
    "Parser",
    "PartError",
    "PersistentQueue",
    "Queue",
    "QueueError",
    "RecipeError",
    "RecipeErrors",
    "Request",
    "Response",
    "ScrapekitError",
    "Seconds",
    "Source",
    "Store",
    "StoreError",
    "Transaction",
    "__version__",
    "canonical_url",
]
