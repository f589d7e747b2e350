//! The workspace's file-level import graph, read from the sources with `syn`, so a test can
//! hold each crate to "no import circle of more than one file" (a circle ties its files into
//! one unit: none can be read, tested or moved alone).
//!
//! An edge `a → b` means code in file `a` names an item of file `b`: a `use` of a `crate::`,
//! `super::`, `self::` or child-module path, or such a path written in code. Paths are
//! resolved to the file that defines the module they name, through re-exports (`pub use`), so
//! naming `crate::Thing` that `lib.rs` re-exports from `thing.rs` is an edge to `thing.rs`,
//! not to `lib.rs`. `#[cfg(test)]` modules are left out (tests may reach anywhere), and so
//! are `src/bin/` and a `main.rs` beside a `lib.rs` (separate crates that use the library by
//! name). `mod x;` declarations are not edges: declaring a child is not using it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

type ModPath = Vec<String>;

/// One crate's files and who names whom.
#[derive(Debug, Default)]
pub struct ImportGraph {
    pub files: Vec<PathBuf>,
    pub edges: BTreeSet<(usize, usize)>,
}

impl ImportGraph {
    /// Reads the crate whose sources are under `src`, following re-exports to the file that
    /// defines what they name.
    pub fn of_crate(src: &Path) -> ImportGraph {
        ImportGraph::read(src, true)
    }

    /// Reads the crate as its text reads: a path through a re-export (`pub use`) is an edge
    /// to the file that re-exports, as a reader following the path would open it.
    pub fn of_crate_as_written(src: &Path) -> ImportGraph {
        ImportGraph::read(src, false)
    }

    fn read(src: &Path, follow_reexports: bool) -> ImportGraph {
        let mut files = Vec::new();
        collect(src, src, &mut files);
        files.sort();
        let has_lib = src.join("lib.rs").is_file();
        let files: Vec<PathBuf> = files.into_iter().filter(|f| !(has_lib && f == &src.join("main.rs"))).collect();

        // Every module (files and inline modules) → the file that holds it, and each module's
        // imported names (`use a::b::C` in module m: m::C → a::b::C), for re-exports.
        let mut modules: BTreeMap<ModPath, usize> = BTreeMap::new();
        let mut parsed = Vec::new();
        for (i, file) in files.iter().enumerate() {
            let path = module_path(src, file);
            modules.insert(path.clone(), i);
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            parsed.push((path, ast));
        }
        let mut collector = Collector { modules: &mut modules, file: 0, stack: Vec::new(), uses: Vec::new() };
        for (i, (path, ast)) in parsed.iter().enumerate() {
            collector.file = i;
            collector.stack = vec![path.clone()];
            collector.visit_file(ast);
        }
        let uses = std::mem::take(&mut collector.uses);
        let aliases: BTreeMap<ModPath, ModPath> = uses
            .iter()
            .filter(|u| u.is_use)
            .filter_map(|u| {
                let absolute = resolve(&modules, &u.module, &u.path)?;
                let name = u.alias.clone().or_else(|| u.path.last().cloned())?;
                let mut local = u.module.clone();
                local.push(name);
                (local != absolute).then_some((local, absolute))
            })
            .collect();

        let mut edges = BTreeSet::new();
        for u in &uses {
            let Some(mut absolute) = resolve(&modules, &u.module, &u.path) else { continue };
            // Follow re-exports: the longest prefix that is an alias is replaced by its target.
            for _ in 0..if follow_reexports { 16 } else { 0 } {
                let Some(n) = (1..=absolute.len()).rev().find(|n| aliases.contains_key(&absolute[..*n])) else { break };
                let mut target = aliases[&absolute[..n]].clone();
                target.extend_from_slice(&absolute[n..]);
                if target == absolute {
                    break;
                }
                absolute = target;
            }
            let Some(to) = owner(&modules, &absolute) else { continue };
            if to != u.file {
                edges.insert((u.file, to));
            }
        }
        ImportGraph { files, edges }
    }

    /// The circles: strongly connected sets of more than one file, each sorted, largest first.
    pub fn circles(&self) -> Vec<Vec<&Path>> {
        let n = self.files.len();
        let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &(a, b) in &self.edges {
            next[a].push(b);
        }
        let mut out: Vec<Vec<&Path>> = strongly_connected(&next)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let mut files: Vec<&Path> = c.iter().map(|&i| self.files[i].as_path()).collect();
                files.sort();
                files
            })
            .collect();
        out.sort_by_key(|c| std::cmp::Reverse(c.len()));
        out
    }
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path != root.join("bin") {
                collect(root, &path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` → `[a, b]`; `src/lib.rs` / `src/main.rs` → `[]`.
fn module_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: ModPath = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
        parts.push(stem.to_string());
    }
    parts
}

/// The file holding the longest known module prefix of `path`.
fn owner(modules: &BTreeMap<ModPath, usize>, path: &[String]) -> Option<usize> {
    (0..=path.len()).rev().find_map(|n| modules.get(&path[..n]).copied())
}

/// `path` as written in module `at`, made absolute; `None` for paths into other crates.
fn resolve(modules: &BTreeMap<ModPath, usize>, at: &[String], path: &[String]) -> Option<ModPath> {
    let first = path.first()?;
    let (mut base, rest): (ModPath, &[String]) = match first.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (at.to_vec(), &path[1..]),
        "super" => {
            let mut base = at.to_vec();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            (base, rest)
        }
        // A child module named without `self::` (2018 paths).
        name => {
            let mut child = at.to_vec();
            child.push(name.to_string());
            if !modules.contains_key(&child) {
                return None;
            }
            (at.to_vec(), path)
        }
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

/// A path named in module `module` of file `file`; `is_use` for `use` items (which also make
/// a local name, `alias` or the path's last segment, for re-export resolution).
struct Use {
    file: usize,
    module: ModPath,
    path: ModPath,
    alias: Option<String>,
    is_use: bool,
}

struct Collector<'a> {
    modules: &'a mut BTreeMap<ModPath, usize>,
    file: usize,
    stack: Vec<ModPath>,
    uses: Vec<Use>,
}

impl Collector<'_> {
    fn module(&self) -> ModPath {
        self.stack.last().cloned().unwrap_or_default()
    }

    fn use_tree(&mut self, prefix: &mut ModPath, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.push_use(prefix, Some(n.ident.to_string()), None),
            syn::UseTree::Rename(r) => self.push_use(prefix, Some(r.ident.to_string()), Some(r.rename.to_string())),
            syn::UseTree::Glob(_) => self.push_use(prefix, None, None),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    fn push_use(&mut self, prefix: &ModPath, name: Option<String>, alias: Option<String>) {
        let mut path = prefix.clone();
        // `use a::b::{self}` names `a::b`.
        match name {
            Some(n) if n != "self" => path.push(n),
            _ => {}
        }
        let is_use = !path.is_empty();
        self.uses.push(Use { file: self.file, module: self.module(), path, alias, is_use });
    }
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| a.path().is_ident("cfg") && a.meta.require_list().is_ok_and(|l| l.tokens.to_string().contains("test")))
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if is_cfg_test(&item.attrs) {
            return;
        }
        if let Some((_, items)) = &item.content {
            let mut path = self.module();
            path.push(item.ident.to_string());
            self.modules.insert(path.clone(), self.file);
            self.stack.push(path);
            for i in items {
                self.visit_item(i);
            }
            self.stack.pop();
        }
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_cfg_test(&item.attrs) {
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if !is_cfg_test(&item.attrs) {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() > 1 {
            let segments: ModPath = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.uses.push(Use { file: self.file, module: self.module(), path: segments, alias: None, is_use: false });
        }
        syn::visit::visit_path(self, path);
    }
}

/// Tarjan's strongly connected components, iteratively (no recursion depth limit).
fn strongly_connected(next: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = next.len();
    let (mut index, mut low, mut on_stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut out, mut counter) = (Vec::new(), Vec::new(), 0);
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        let mut work = vec![(start, 0usize)];
        while let Some(&mut (v, ref mut i)) = work.last_mut() {
            if *i == 0 {
                index[v] = counter;
                low[v] = counter;
                counter += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = next[v].get(*i) {
                *i += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(component);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_circle_of_two_is_found_and_a_chain_is_not() {
        // 0 → 1 → 2 → 1, 3 alone.
        let next = vec![vec![1], vec![2], vec![1], vec![]];
        let mut sccs: Vec<Vec<usize>> = strongly_connected(&next).into_iter().filter(|c| c.len() > 1).collect();
        for c in &mut sccs {
            c.sort();
        }
        assert_eq!(sccs, vec![vec![1, 2]]);
    }
}
