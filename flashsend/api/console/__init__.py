"""The operator console: server-rendered pages over the API's operations, served by the same
FastAPI app (`flashsend api`) at `/` (docs/console.md)."""
