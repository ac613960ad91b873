"""Talking to an OpenAI-compatible server over HTTP: the client every served backend shares (`client`), one
streamed request (`stream`), the server's Prometheus counters (`metrics`), and the `openai` backend, for a server
someone else started (`openai`)."""
