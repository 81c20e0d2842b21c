// Package drill is the recovery drill behind `shardpool drill`: on a tiny
// fixture it owns, through real coordinator and worker processes of the
// shardpool binary, it SIGKILLs a worker mid-shard and the coordinator
// (once more while shards run, kept down past the lease TTL), corrupts a checkpoint generation and truncates a committed output, holds
// a shard that no worker can take, and then checks that recovery left
// every result correct and committed exactly once. Recovery from a host
// losing power, which a drill cannot observe for real from inside one
// boot, is simulated where the host allows (root, loop devices: package
// powercut) and reported as UNVERIFIED where it does not. It exits
// successfully only when every check passed.
package drill
