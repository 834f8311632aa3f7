"""Real services for the test suite: Redis, Redis Cluster, Apache Kafka and tritonserver.

Each module installs what its service needs when it is missing (cached between runs, see
``install``) and starts the service on 127.0.0.1 with free ports, as a process in its own
process group whose output goes to a log file. Nothing here imports pytest: ``tests/conftest.py``
wraps these classes as session-scoped fixtures.
"""
