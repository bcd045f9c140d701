"""What quantkit writes: staging and locking, export formats, model cards, publishing."""
