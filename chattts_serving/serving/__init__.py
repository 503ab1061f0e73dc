"""The entry models' logic, free of Triton: request parsing, the pipeline, admission, the stream
lifecycle, resilience, the entry service, profiles and logs."""
