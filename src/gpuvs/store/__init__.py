"""The store: SQLite (db), the typed records it returns (records) and the ids it keys them by (ids)."""
