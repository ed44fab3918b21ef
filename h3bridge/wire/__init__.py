"""The wire: what crosses HTTP between an h3bridge client and a Videos API server, defined once for
both ends. The server (server/) answers in it and the remote engine (engines/remote.py) speaks it;
neither imports the other.

- videos.py: the OpenAI Videos API as h3bridge speaks it (a GenerationRequest <-> a POST body, the
  job object, errors, the Idempotency-Key header).
- peers.py: the peers' dialects (vLLM-Omni, SGLang): their request and job models.
- events.py: a job's progress as server-sent events (progress, preview, end).

It imports only what lies below it (errors, safeio, geometry, request, vocabulary, progress, media).
"""
