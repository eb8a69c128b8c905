"""The HTTP server around the app: uvicorn, its protocol, the drain lifecycle, and the small endpoints."""
