//! Grouping supported nodes into partitions ORT can fuse. ORT-free: works
//! on node indices in topological order.
//!
//! A partition must be *convex*: no path between two of its nodes may leave
//! it (ORT would have to run the outside node in the middle of kiln's fused
//! node). Groups grow greedily along producer edges in topological order; a
//! node joins (and may merge) the groups of its producers unless a path from
//! that group reaches it through a node outside the group.

use std::collections::BTreeSet;

/// One node of the graph, as the partitioner sees it.
#[derive(Clone, Debug, Default)]
pub struct PNode {
    pub supported: bool,
    /// Indices (into the same slice) of the nodes producing this node's inputs.
    pub producers: Vec<usize>,
}

/// Group ids with union-find, so merged groups answer to one id.
struct Groups {
    parent: Vec<usize>,
    /// Groups that reach a member of this group through an outside node.
    blocked: Vec<BTreeSet<usize>>,
}

impl Groups {
    fn find(&mut self, g: usize) -> usize {
        let mut root = g;
        while self.parent[root] != root {
            root = self.parent[root];
        }
        self.parent[g] = root;
        root
    }

    fn new_group(&mut self) -> usize {
        self.parent.push(self.parent.len());
        self.blocked.push(BTreeSet::new());
        self.parent.len() - 1
    }

    fn canon(&mut self, set: &BTreeSet<usize>) -> BTreeSet<usize> {
        set.iter().map(|&g| self.find(g)).collect()
    }

    fn blocked_of(&mut self, g: usize) -> BTreeSet<usize> {
        let raw = self.blocked[g].clone();
        self.canon(&raw)
    }

    /// Merges `b` into `a`.
    fn merge(&mut self, a: usize, b: usize) {
        let moved = std::mem::take(&mut self.blocked[b]);
        self.blocked[a].extend(moved);
        self.parent[b] = a;
    }
}

/// Returns the partitions (node indices, ascending) of the supported nodes.
pub fn partition(nodes: &[PNode]) -> Vec<Vec<usize>> {
    let mut groups = Groups {
        parent: Vec::new(),
        blocked: Vec::new(),
    };
    let mut group_of: Vec<Option<usize>> = vec![None; nodes.len()];
    // Groups with a member that is an ancestor-or-self of each node.
    let mut reach: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); nodes.len()];
    // Groups each node cannot join: reached through an outside node.
    let mut blocked: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); nodes.len()];

    for (i, node) in nodes.iter().enumerate() {
        let mut my_reach = BTreeSet::new();
        let mut my_blocked = BTreeSet::new();
        let mut candidates = BTreeSet::new();
        for &p in node.producers.iter().filter(|&&p| p < i) {
            let pg = group_of[p].map(|g| groups.find(g));
            let p_reach = groups.canon(&reach[p]);
            my_blocked.extend(groups.canon(&blocked[p]));
            my_blocked.extend(p_reach.iter().copied().filter(|&g| Some(g) != pg));
            my_reach.extend(p_reach);
            candidates.extend(pg);
        }
        if node.supported {
            let g = join(&mut groups, &candidates, &my_blocked);
            groups.blocked[g].extend(my_blocked.iter().copied());
            group_of[i] = Some(g);
            my_reach.insert(g);
        }
        reach[i] = my_reach;
        blocked[i] = my_blocked;
    }
    collect(&mut groups, &group_of)
}

/// Picks (or makes) the group a supported node joins, merging candidate
/// groups when no outside path links them.
fn join(groups: &mut Groups, candidates: &BTreeSet<usize>, blocked: &BTreeSet<usize>) -> usize {
    let mut chosen: Option<usize> = None;
    for &c in candidates.iter().filter(|c| !blocked.contains(c)) {
        let c = groups.find(c);
        match chosen {
            None => chosen = Some(c),
            Some(a) if a == c => {}
            Some(a) => {
                let (ba, bc) = (groups.blocked_of(a), groups.blocked_of(c));
                if !ba.contains(&c) && !bc.contains(&a) {
                    groups.merge(a, c);
                }
            }
        }
    }
    chosen.unwrap_or_else(|| groups.new_group())
}

fn collect(groups: &mut Groups, group_of: &[Option<usize>]) -> Vec<Vec<usize>> {
    let mut by_root: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (i, g) in group_of.iter().enumerate() {
        if let Some(g) = g {
            by_root.entry(groups.find(*g)).or_default().push(i);
        }
    }
    let mut parts: Vec<Vec<usize>> = by_root.into_values().collect();
    parts.sort_by_key(|p| p[0]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(supported: bool, producers: &[usize]) -> PNode {
        PNode {
            supported,
            producers: producers.to_vec(),
        }
    }

    /// Every path between two nodes of a partition stays inside it.
    fn assert_convex(nodes: &[PNode], parts: &[Vec<usize>]) {
        for part in parts {
            let inside: BTreeSet<usize> = part.iter().copied().collect();
            // descendants of the partition reachable through an outside node
            let mut tainted = vec![false; nodes.len()];
            for (i, node) in nodes.iter().enumerate() {
                tainted[i] = node
                    .producers
                    .iter()
                    .any(|&p| tainted[p] || (!inside.contains(&p) && reaches_from(nodes, &inside, p)))
                    && !node.producers.is_empty();
                if inside.contains(&i) {
                    assert!(
                        !tainted[i],
                        "node {i} of {part:?} is reached from the partition through an outside node"
                    );
                }
            }
        }
    }

    fn reaches_from(nodes: &[PNode], inside: &BTreeSet<usize>, x: usize) -> bool {
        nodes[x]
            .producers
            .iter()
            .any(|&p| inside.contains(&p) || reaches_from(nodes, inside, p))
    }

    #[test]
    fn chain_is_one_partition() {
        let g = [n(true, &[]), n(true, &[0]), n(true, &[1])];
        assert_eq!(partition(&g), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn unsupported_node_splits_a_chain() {
        let g = [n(true, &[]), n(false, &[0]), n(true, &[1]), n(true, &[2])];
        let parts = partition(&g);
        assert_eq!(parts, vec![vec![0], vec![2, 3]]);
        assert_convex(&g, &parts);
    }

    #[test]
    fn diamond_through_outside_node_is_not_fused() {
        // 0 -> 1(unsupported) -> 2, and 0 -> 2 directly: 2 cannot join 0.
        let g = [n(true, &[]), n(false, &[0]), n(true, &[0, 1])];
        let parts = partition(&g);
        assert_eq!(parts, vec![vec![0], vec![2]]);
        assert_convex(&g, &parts);
    }

    #[test]
    fn independent_branches_merge_at_a_common_consumer() {
        let g = [n(true, &[]), n(true, &[]), n(true, &[0, 1])];
        assert_eq!(partition(&g), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn no_merge_when_one_branch_reaches_the_other_outside() {
        // 0 -> 1(unsupported) -> 2 ; 3 consumes 0 and 2.
        let g = [n(true, &[]), n(false, &[0]), n(true, &[1]), n(true, &[0, 2])];
        let parts = partition(&g);
        assert_convex(&g, &parts);
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 3);
    }

    #[test]
    fn nothing_supported_gives_nothing() {
        let g = [n(false, &[]), n(false, &[0])];
        assert!(partition(&g).is_empty());
    }

    #[test]
    fn randomised_graphs_stay_convex_and_cover_supported_nodes() {
        let mut seed = 0x2545_f491_u64;
        let mut rnd = move |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for _ in 0..300 {
            let len = 2 + rnd(12) as usize;
            let g: Vec<PNode> = (0..len)
                .map(|i| {
                    let producers = (0..i).filter(|_| rnd(3) == 0).collect::<Vec<_>>();
                    n(rnd(4) != 0, &producers)
                })
                .collect();
            let parts = partition(&g);
            assert_convex(&g, &parts);
            let covered: usize = parts.iter().map(Vec::len).sum();
            assert_eq!(covered, g.iter().filter(|x| x.supported).count());
        }
    }
}
