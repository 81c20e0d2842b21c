// Package plan is shardpool's admission math: how many shards of a class
// fit a host's effective budget, which shards are outliers, and which no
// host can ever run.
//
// slots(class) = floor((budget − shared) / peak(class)) per resource (CPU
// millicores, memory, GPUs, VRAM), the minimum over the resources the class
// needs. The budget already has the policy's reserve taken off (package
// probe). A budget that is unknown for a resource the class needs gives 0
// slots and says why: unknown capacity is not admitted. A class that needs
// a resource but has no measured or declared peak for it gets 0 slots too:
// shardpool measures rather than guesses.
package plan
