"""`quantkit run`: every variant through convert, eval, bench and export, then the report."""
