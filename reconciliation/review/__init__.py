"""The operators' review queue: selectors (queue reads), services (claims and decisions) and
presentation (what the case page shows)."""
