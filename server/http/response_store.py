"""The Responses API's store: the responses a server keeps in memory, by id, for
``previous_response_id``, ``GET`` / ``DELETE /v1/responses/{id}`` and ``cancel``.

Bounded by count (``CAPACITY``, the oldest leaves first); nothing is written to disk, so a
restart forgets them all. Each entry keeps the conversation it continued as chat messages, so a
follow-up is rendered by the template exactly as the whole conversation would be. The entries
share their messages (a follow-up's conversation is a new list of the same message objects), so a
long chain of turns costs a list of references per turn, not a copy of the text. Writes run on the
event loop; a request's plan, in a worker thread, only reads (``get``: one dict lookup, atomic
under the GIL): no locks.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

CAPACITY = 1024  # responses kept; the oldest is dropped first


@dataclass
class StoredResponse:
    response: dict  # the response object, as GET returns it
    conversation: list[dict] = field(default_factory=list)  # chat messages: earlier turns and this input
    reply: dict | None = None  # this response's output as one assistant chat message (None until it ends)
    worker: asyncio.Task | None = None  # a background response's run, while it runs

    def history(self) -> list[dict]:
        """The conversation a follow-up continues: this one's, then its reply."""
        return [*self.conversation, *([self.reply] if self.reply is not None else [])]


class ResponseStore:
    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._entries

    def put(self, response_id: str, entry: StoredResponse) -> None:
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            _, dropped = self._entries.popitem(last=False)
            if dropped.worker is not None:
                dropped.worker.cancel()

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.pop(response_id, None)
        if entry is not None and entry.worker is not None:
            entry.worker.cancel()
        return entry
