"""The store: SQLite (db) and the typed records it returns (records)."""
