"""The Campaign HTTP API (`flashsend api`): FastAPI over the stores and operations the command
line uses, with API keys and roles, idempotent POSTs, the audit log and live progress."""
