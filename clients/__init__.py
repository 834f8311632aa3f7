"""Python clients and the ``tierserve`` command line."""
