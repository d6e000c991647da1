"""``redrafter-operator check``: a preflight of the cluster (and of resources about to be applied).

Read once (facts), judge purely (checks), print (report): the judging never talks to the API, so every
rule is testable from stated facts and the command reads each object at most once.
"""
