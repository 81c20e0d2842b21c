// Package drill is the recovery drill behind `shardpool drill`: on a tiny
// fixture it owns, through real coordinator and worker processes of the
// shardpool binary, it SIGKILLs a worker mid-shard and the coordinator,
// corrupts a checkpoint generation and truncates a committed output, holds
// a shard that no worker can take, and then checks that recovery left
// every result correct and committed exactly once. It exits successfully
// only when every check passed. Reboot recovery cannot be observed from
// inside one boot and is reported as UNVERIFIED.
package drill
