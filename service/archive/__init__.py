"""Archive: finished groups to Parquet (service.archive.service)."""
