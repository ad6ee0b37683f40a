"""Stream transport and processor: events in, detector results out."""
