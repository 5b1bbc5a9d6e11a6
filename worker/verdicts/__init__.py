"""From what was measured to what is said: the verdict rules (`rules`), whose fault a failure is
(`faults`), and the retry that confirms a head fault before it becomes the PR's verdict (`attribution`)."""
