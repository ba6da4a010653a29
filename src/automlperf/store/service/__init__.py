"""The run's store service: one process per run on a PostgreSQL store that owns the database
connections and serves the store's calls to the replicas and the primary over TCP.

* client.py: :class:`~automlperf.store.service.client.RemoteStore`, the store as its clients
  reach it (a :class:`~automlperf.store.base.Store`), and where a run's service is written.
* wire.py: the protocol both sides speak (frames of JSON; records as lists).
* server.py: :class:`~automlperf.store.service.server.Service`, the calls, answered from
  memory or through the database.
* state.py: what the service keeps in memory of each run.
* db.py: its database connections and the writer thread's group commit.
* net.py: its network side (listening, greeting clients, the heartbeats' flush).
* process.py: :class:`~automlperf.store.service.process.ServiceProcess`, the process as the
  primary starts, restarts and stops it.
* __main__.py: the process itself, ``python -m automlperf.store.service``.

Importing the package loads none of its modules: a client does not load the server."""
