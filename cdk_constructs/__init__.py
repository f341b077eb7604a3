"""One L3 construct per concern. Named cdk_constructs, not constructs, because a
top-level package called constructs would shadow the library aws-cdk imports."""
