"""Python SDK (filled in by the live-stack work)."""
