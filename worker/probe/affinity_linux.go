package probe

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

func schedAffinity() (int, string, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0, "", err
	}
	var ids []string
	for i := 0; i < len(set)*64; i++ {
		if set.IsSet(i) {
			ids = append(ids, fmt.Sprint(i))
		}
	}
	return set.Count(), strings.Join(ids, ","), nil
}
