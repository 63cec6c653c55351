"""Python functions served as models: declarations (spec), the @batch decorator, the model folder written for a
bound function (writer) and the model that runs it in a worker process or in-process (worker)."""
