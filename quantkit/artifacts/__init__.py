"""What quantkit writes: staging and locking, artifact containers, model cards, publishing."""
