"""Type stubs of the native module (the Python package wraps it: use cairn.MemoryHarness)."""

from typing import Awaitable

class Error(Exception):
    """A Cairn error; args are (code, message), code one of not_found, invalid_input,
    conflict, storage, embedding, other."""

class Harness:
    def __init__(self, path: str, embedder: str = "minilm", cache: bool = True) -> None: ...
    def call(self, method: str, args: str) -> str:
        """Runs an operation (arguments and result as JSON) with the GIL released."""
    def acall(self, method: str, args: str) -> Awaitable[str]:
        """The same, as an awaitable for asyncio."""

def display_location(location: str) -> str:
    """A store location for display: a PostgreSQL URL without its password."""
