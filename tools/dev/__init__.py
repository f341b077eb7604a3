"""Development scripts: what this repository's maintainers run (make review, fetch-schemas, benchmark;
the serving lock), never a deploy."""
