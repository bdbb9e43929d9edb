"""Quality measurements on real data: precision, recall, agreement with other tools."""
