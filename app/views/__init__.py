"""Inspector panels shown as tabs of the main window (GQA groups, masks, next token, ...)."""
