"""Admin edits: the overlay on the config file (overlay), where it is stored (store), the edit rules
(service) and the JSON shapes (views). See docs/admin.md."""
