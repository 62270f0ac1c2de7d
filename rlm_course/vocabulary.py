"""The names the course gives to the parts of an RL iteration and to where its models run, in one
place (a leaf module: every layer may import it).

The trainer times four stages (:data:`STAGES`); a worker's timeline shows them and the moves of
weights around them (:data:`TIMELINE_STAGES`); the cost model splits generation into its prefill
and its decode, and training into the policy's and the critic's updates (:data:`COST_STAGES`,
each belonging to one of :data:`STAGES` by :data:`STAGE_OF`; the reward, a verifier on the CPU,
is not priced). The actor (trainer) and the rollout engine are colocated or disaggregated
(:data:`PLACEMENTS`).
"""

#: The stages of one RL iteration that the trainer times and every run reports, in order.
STAGES = ("generation", "reward", "scoring", "training")
#: What a worker's timeline shows, in drawing order: the stages, the weight sync and resharding
#: between them, and the evaluations.
TIMELINE_STAGES = ("generation", "reward", "scoring", "training", "sync", "reshard", "evaluation")
#: The stages the cost model prices.
COST_STAGES = ("prefill", "decode", "scoring", "policy update", "critic update")
#: The trainer's stage of each priced stage.
STAGE_OF = {"prefill": "generation", "decode": "generation", "scoring": "scoring",
            "policy update": "training", "critic update": "training"}
#: Where the actor and the rollout engine run: on the same devices (time-sharing them, the
#: weights handed over in process) or on separate ones (the weights synced over a network).
PLACEMENTS = ("colocated", "disaggregated")
#: How a batch's samples reach the generation replicas: a group's samples together on one replica
#: (the batch split in contiguous shards over the engines), or each sample a request of its own,
#: sent to the replicas in turn (an engine served request by request).
ROUTINGS = ("group", "sample")
