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

/// Merges partitions wherever the union stays convex: two partitions can be
/// one when no path leads from one to the other through any third node
/// (an ORT node or another partition). Fewer partitions cost fewer calls
/// and edge crossings; the greedy grouping above misses e.g. independent
/// branches that never meet at a supported node.
pub fn merge(nodes: &[PNode], parts: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
    let mut parts = split_cycles(nodes, parts);
    while let Some((a, b)) = mergeable_pair(nodes, &parts) {
        let moved = std::mem::take(&mut parts[b]);
        parts[a].extend(moved);
        parts[a].sort_unstable();
        parts.remove(b);
    }
    parts
}

/// Partitions that are each convex can still wait on each other (A feeds
/// an ORT node feeding B while B feeds one feeding A): ORT could run
/// neither. The greedy grouping can produce such pairs; their nodes are
/// split into single-node partitions here, which `merge` regroups safely.
fn split_cycles(nodes: &[PNode], parts: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
    let dag = Condensed::new(nodes, &parts);
    if dag.acyclic {
        return parts;
    }
    let mut out = Vec::new();
    for (p, part) in parts.into_iter().enumerate() {
        if dag.ordered[p] {
            out.push(part);
        } else {
            out.extend(part.into_iter().map(|i| vec![i]));
        }
    }
    out.sort_by_key(|p| p[0]);
    out
}

/// The first pair of partitions (a < b) whose union is convex, preferring
/// a pair joined by an edge.
fn mergeable_pair(nodes: &[PNode], parts: &[Vec<usize>]) -> Option<(usize, usize)> {
    if parts.len() < 2 {
        return None;
    }
    let dag = Condensed::new(nodes, parts);
    let indirect: Vec<Bits> = (0..parts.len()).map(|p| dag.indirect(p)).collect();
    let ok = |a: usize, b: usize| !indirect[a].has(b) && !indirect[b].has(a);
    let linked = (0..parts.len())
        .flat_map(|a| dag.succ[a].iter().map(move |&b| (a, b)))
        .filter(|&(_, b)| b < parts.len())
        .find(|&(a, b)| ok(a, b));
    let pairs = (0..parts.len()).flat_map(|a| (a + 1..parts.len()).map(move |b| (a, b)));
    linked
        .map(|(a, b)| (a.min(b), a.max(b)))
        .or_else(|| pairs.into_iter().find(|&(a, b)| ok(a, b)))
}

#[derive(Clone)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(len: usize) -> Bits {
        Bits(vec![0; len.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn union(&mut self, other: &Bits) {
        self.0.iter_mut().zip(&other.0).for_each(|(a, b)| *a |= b);
    }
}

/// The graph with each partition contracted to one node: partition `p` is
/// node `p`, graph node `i` outside every partition is `parts.len() + i`.
struct Condensed {
    succ: Vec<Vec<usize>>,
    /// Strict descendants of each condensed node (only meaningful when acyclic).
    below: Vec<Bits>,
    acyclic: bool,
    /// Whether each node got a place in a topological order (false: on or
    /// behind a cycle).
    ordered: Vec<bool>,
}

impl Condensed {
    fn new(nodes: &[PNode], parts: &[Vec<usize>]) -> Condensed {
        let count = parts.len() + nodes.len();
        let mut id: Vec<usize> = (0..nodes.len()).map(|i| parts.len() + i).collect();
        for (p, part) in parts.iter().enumerate() {
            part.iter().for_each(|&i| id[i] = p);
        }
        let mut succ = vec![Vec::new(); count];
        for (i, node) in nodes.iter().enumerate() {
            for &p in &node.producers {
                if id[p] != id[i] && !succ[id[p]].contains(&id[i]) {
                    succ[id[p]].push(id[i]);
                }
            }
        }
        let order = topological(&succ);
        let mut ordered = vec![false; count];
        order.iter().for_each(|&v| ordered[v] = true);
        let below = descendants(&succ, &order);
        Condensed {
            acyclic: order.len() == count,
            succ,
            below,
            ordered,
        }
    }

    /// Condensed nodes reachable from `p` through at least one other node.
    fn indirect(&self, p: usize) -> Bits {
        let mut out = Bits::new(self.succ.len());
        for &w in &self.succ[p] {
            out.union(&self.below[w]);
        }
        out
    }
}

/// Kahn's order of a graph given by successor lists (shorter than the graph
/// when it has a cycle).
fn topological(succ: &[Vec<usize>]) -> Vec<usize> {
    let mut indegree = vec![0usize; succ.len()];
    succ.iter().flatten().for_each(|&w| indegree[w] += 1);
    let mut order: Vec<usize> = (0..succ.len()).filter(|&v| indegree[v] == 0).collect();
    let mut next = 0;
    while next < order.len() {
        for &w in &succ[order[next]] {
            indegree[w] -= 1;
            if indegree[w] == 0 {
                order.push(w);
            }
        }
        next += 1;
    }
    order
}

/// Strict descendants of every node in `order` (a topological order).
fn descendants(succ: &[Vec<usize>], order: &[usize]) -> Vec<Bits> {
    let mut below = vec![Bits::new(succ.len()); succ.len()];
    for &v in order.iter().rev() {
        let mut bits = Bits::new(succ.len());
        for &w in &succ[v] {
            bits.set(w);
            bits.union(&below[w]);
        }
        below[v] = bits;
    }
    below
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
    fn independent_partitions_merge() {
        // 0 -> 1(unsupported) -> 3 ; 2 is independent of both sides.
        let g = [n(true, &[]), n(false, &[0]), n(true, &[]), n(true, &[1])];
        let parts = merge(&g, partition(&g));
        assert_eq!(parts, vec![vec![0, 2], vec![3]]);
        assert_convex(&g, &parts);
    }

    #[test]
    fn partitions_waiting_on_each_other_are_regrouped() {
        // The greedy grouping gives [1, 2, 8, 9] and [4, 7]: 1 -> 3(ORT) -> 7
        // and 4 -> 6(ORT) -> 8, so neither could run first.
        let g = [
            n(false, &[]),
            n(true, &[0]),
            n(true, &[0]),
            n(false, &[0, 1]),
            n(true, &[]),
            n(false, &[1, 2, 3]),
            n(false, &[4]),
            n(true, &[1, 3, 4]),
            n(true, &[1, 2, 6]),
            n(true, &[8]),
            n(false, &[0, 2, 4, 5, 7]),
        ];
        let greedy = partition(&g);
        assert!(!Condensed::new(&g, &greedy).acyclic);
        let parts = merge(&g, greedy);
        assert!(Condensed::new(&g, &parts).acyclic, "{parts:?}");
        assert_convex(&g, &parts);
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 6);
    }

    #[test]
    fn partitions_linked_through_ort_stay_apart() {
        let g = [n(true, &[]), n(false, &[0]), n(true, &[1])];
        assert_eq!(merge(&g, partition(&g)), vec![vec![0], vec![2]]);
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
            let merged = merge(&g, parts.clone());
            assert_convex(&g, &merged);
            if Condensed::new(&g, &parts).acyclic {
                assert!(merged.len() <= parts.len());
            }
            assert_eq!(merged.iter().map(Vec::len).sum::<usize>(), covered);
            assert!(mergeable_pair(&g, &merged).is_none());
            assert!(Condensed::new(&g, &merged).acyclic, "{merged:?} wait on each other");
        }
    }
}
